/*
 * rope_cpu.h - rope's per-pair angle tables on the CPU, for lmk_rope (src/ops/rope/cpu.c, which
 * implements them) and lmk_attn_prologue (src/ops/attn_prologue/cpu.c). One copy of the factor
 * rule and of the choice between the vector and the libm sin/cos, so that at a given ISA level both
 * ops give a (token, pair) the same m*cos and m*sin.
 */
#ifndef LMK_ROPE_CPU_H
#define LMK_ROPE_CPU_H

#include "cpu/cpu.h"
#include "ops/rope/rope.h"

/* axis[i] and freq[i] = lmk_rope_freq of pair p0 + i (lmk_rope_axis_j's axis; freq_factors
 * included) for i < n, zero up to n rounded up to 8 (the vector tail reads whole groups of 8, so
 * the arrays hold that many). Returns the largest |freq[i]| (infinite if one is). */
double lmk_rope_cpu_freqs(const lmk_rope_angle *g, size_t p0, size_t n, unsigned char *restrict axis,
                          double *restrict freq);

/* c[i] = m*cos(theta[i]) and s[i] = m*sin(theta[i]), theta[i] = pos[axis[i]] * freq[i] in double,
 * for the positions of `token` (lmk_rope_pos), i < n, rounded to f32 by lmk_cpu_sincos: at level
 * isa while every |theta| <= LMK_CPU_SINCOS_VECTOR_MAX (max |pos| * max_freq, from
 * lmk_rope_cpu_freqs, says so), else at the scalar level (libm). theta is a scratch array of n
 * rounded up to 8 doubles; NULL means no scratch (then libm, each theta formed as it is used: the
 * same bits as the scalar level). c and s hold n rounded up to 8 floats at the vector levels. */
void lmk_rope_cpu_angles(lmk_cpu_isa isa, const lmk_rope_angle *g, size_t token, const unsigned char *restrict axis,
                         const double *restrict freq, double max_freq, size_t n, double *restrict theta,
                         float *restrict c, float *restrict s);

#endif /* LMK_ROPE_CPU_H */
