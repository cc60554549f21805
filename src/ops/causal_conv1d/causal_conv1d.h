/*
 * causal_conv1d.h - the arguments a causal_conv1d launch hands to a backend, and the reference
 * over them (lmk.h, "causal_conv1d").
 */
#ifndef LMK_OPS_CAUSAL_CONV1D_H
#define LMK_OPS_CAUSAL_CONV1D_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmk_causal_conv1d_args {
    const void *x;                /* [T, C], channels dense */
    void *y;                      /* [T, C]; may equal x (in_place) */
    lmk_dtype dtype;              /* x, y and the state: f32, bf16 or f16 */
    size_t T, C, W;               /* tokens, channels, width (2..8) */
    size_t x_tok, y_tok;          /* token strides in elements */
    bool in_place;                /* y is x (same address and token stride) */
    const void *weight;           /* [C, W] dense; weight[c, W-1] multiplies the current token */
    lmk_dtype w_dtype;
    const void *bias;             /* [C] dense, or NULL */
    lmk_dtype bias_dtype;
    const void *cu_seqlens;       /* [n_seq + 1], or NULL: one sequence of T tokens */
    int cu_is64;
    const void *slots;            /* [n_seq], or NULL: sequence s uses row s */
    int slots_is64;
    size_t n_seq;
    void *state;                  /* [n_slots, W-1, C] of dtype, any strides, or NULL */
    size_t n_slots;
    size_t st_slot, st_row, st_ch; /* the state's strides in elements */
    lmk_activation act;
} lmk_causal_conv1d_args;

/* The float64 reference over host memory: y and the state rows exactly as lmk.h defines them,
 * rounded once to the output dtype. Each input element is read before its output element is written
 * (a channel at a time), so it is right in place too. */
void lmk_ref_causal_conv1d(const lmk_causal_conv1d_args *a);

#ifdef __cplusplus
}
#endif
#endif /* LMK_OPS_CAUSAL_CONV1D_H */
