/*
 * rope_angles.h - rope's per-pair angle tables on the CPU, for lmk_rope (src/ops/rope/cpu.c) and
 * lmk_attn_prologue (src/ops/attn_prologue/cpu.c). One copy of the factor rule and of the choice
 * between the vector and the libm sin/cos, so that at a given ISA level both ops give a (token,
 * pair) the same m*cos and m*sin. Both steps are inline: each op calls them from its own chunk and
 * token loops (a call per token and chunk showed in a decode call's time), and neither op calls
 * into the other.
 *
 * The tables are built in two steps: per chunk of pairs, the angle factor freq(p) and the pair's
 * position axis (src/ops/rope_math.h's rules of every mode, the YaRN ramp and freq_factors); per
 * token, theta = pos * freq in double, then m*cos and m*sin rounded to f32 by lmk_cpu_sincos
 * (src/cpu/sincos.c; docs/cpu.md, "Angles: lmk_cpu_sincos").
 */
#ifndef LMK_CPU_ROPE_ANGLES_H
#define LMK_CPU_ROPE_ANGLES_H

#include "cpu/cpu.h"
#include "ops/rope/rope.h"
#include "ops/rope_math.h"

#include <math.h>

/* lmk_rope_cpu_freqs at a given `plain` (no scaling, no freq_factors: every lmk_rope_multi call),
 * which passes lmk_rope_freq those values as constants that fold away: a decode call,
 * single-threaded and short, pays this loop on its critical path. */
LMK_INLINE double lmk_rope_cpu_freqs_as(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
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

/* axis[i] and freq[i] = lmk_rope_freq of pair p0 + i (lmk_rope_axis_j's axis; freq_factors
 * included) for i < n, zero up to n rounded up to 8 (the vector tail reads whole groups of 8, so
 * the arrays hold that many). Returns the largest |freq[i]| (infinite if one is). */
LMK_INLINE double lmk_rope_cpu_freqs(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
                                     double *restrict freq)
{
    if (!g->freq_factors && g->freq_scale == 1.0 && g->ext_factor == 0.0)
        return lmk_rope_cpu_freqs_as(g, p0, n, axis, freq, 1);
    return lmk_rope_cpu_freqs_as(g, p0, n, axis, freq, 0);
}

/* c[i] = m*cos(theta[i]) and s[i] = m*sin(theta[i]), theta[i] = pos[axis[i]] * freq[i] in double,
 * for the positions of `token` (lmk_rope_pos), i < n, rounded to f32 by lmk_cpu_sincos: at level
 * isa while every |theta| <= LMK_CPU_SINCOS_VECTOR_MAX (max |pos| * max_freq, from
 * lmk_rope_cpu_freqs, says so), else at the scalar level (libm). theta is a scratch array of n
 * rounded up to 8 doubles; NULL means no scratch (then libm, each theta formed as it is used: the
 * same bits as the scalar level). c and s hold n rounded up to 8 floats at the vector levels. */
LMK_INLINE void lmk_rope_cpu_angles(lmk_cpu_isa isa, const lmk_rope_angle *g, size_t token,
                                    const unsigned char *restrict axis, const double *restrict freq, double max_freq,
                                    size_t n, double *restrict theta, float *restrict c, float *restrict s)
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

#endif /* LMK_CPU_ROPE_ANGLES_H */
