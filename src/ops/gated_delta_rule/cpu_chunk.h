/*
 * cpu_chunk.h - the chunked (WY / UT-transform) form of gated_delta_rule on the CPU: the contract
 * between the driver in cpu.c (which reads the operands, computes the gates and the L2-normed q and
 * k rows, widens v, and norms and rounds the o rows) and the f32 tile products of cpu_chunk.c.
 *
 * One chunk of L <= cap tokens of one (sequence, value head), as docs/cpu.md ("gated_delta_rule,
 * chunked") derives it from lmk.h's recurrence, with decay_i = e^{g_i} and the state S [dk, dv]:
 *     D_ij  = decay_{j+1} ... decay_i (j <= i; 1 on the diagonal)   never a ratio of two products
 *     eg_i  = decay_0 ... decay_i
 *     A_ij  = beta_i D_ij (kn_i . kn_j)  (j < i)        Mqk_ij = D_ij (qn_i . kn_j)  (j <= i)
 *     U     = (I + A)^{-1} diag(beta) (V - diag(eg) Kn S)            forward substitution, in place
 *     O     = diag(eg) Qn S + Mqk U
 *     S'    = eg_{L-1} S + Kn^T diag(D_{L-1, j}) U
 * All in f32 (products with FMA at the vector levels), the state never rounded between chunks.
 */
#ifndef LMK_OPS_GDN_CPU_CHUNK_H
#define LMK_OPS_GDN_CPU_CHUNK_H

#include "cpu/cpu.h"

/* A chunk's arrays in a work area of floats, every row a multiple of 16 floats (64 bytes) long and
 * 64-byte aligned. The caller fills, for tokens t < L: kn and qn rows t (dk floats, zeros up to
 * dkp), vo row t (v widened, zeros up to dvp), decay[t] and beta[t]; S holds the state (zeros in
 * the padding rows and columns, which stay zero). lmk_gdn_cpu_chunk_run leaves o row t in vo row t
 * and the state after the chunk in S; it overwrites every other array. */
typedef struct lmk_gdn_cpu_chunk {
    size_t dk, dv, dkp, dvp; /* head dims; rounded up to 16 and to 32 */
    size_t cap, cp;          /* tokens a chunk holds; cap rounded up to 32 */
    float *S;                /* [dkp][dvp] */
    float *kn, *qn;          /* [cap][dkp] each */
    float *vo;               /* [cap][dvp]: v rows in, o rows out */
    float *decay, *beta;     /* [cp] each */
    float *x;                /* [cap][dvp]: Kn S, then the residuals, then U */
    float *kt;               /* [dkp][cp]: Kn transposed */
    float *kk, *qk;          /* [cap][cp]: Kn Kn^T and Qn Kn^T, then -A and Mqk */
    float *drow, *eg;        /* [cp] each: a row of D; eg */
    void (*tick)(void *ctx); /* called once per block of rows a product computes (NULL: none): */
    void *tick_ctx;          /* the caller prefetches the next chunk's rows a few lines a tick */
} lmk_gdn_cpu_chunk;

/* Lays a chunk of cap tokens (a multiple of 16, at most 64) for head dims dk, dv out in the
 * `floats` floats at work (64-byte aligned). Returns 0 when they do not fit. */
int lmk_gdn_cpu_chunk_init(lmk_gdn_cpu_chunk *c, float *work, size_t floats, size_t dk, size_t dv, size_t cap);

/* The chunk's L tokens (1 <= L <= cap) at the given instruction-set level. Allocates nothing; its
 * stack use is a few hundred bytes. */
void lmk_gdn_cpu_chunk_run(lmk_cpu_isa isa, lmk_gdn_cpu_chunk *c, size_t L);

#endif /* LMK_OPS_GDN_CPU_CHUNK_H */
