/*
 * gated_delta_rule.h - the arguments a gated_delta_rule launch hands to a backend, and the
 * reference over them (lmk.h, "gated_delta_rule").
 */
#ifndef LMK_OPS_GATED_DELTA_RULE_H
#define LMK_OPS_GATED_DELTA_RULE_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Head dims the ops accept (lmk.h): every backend keeps a head's vectors of this size on its stack
 * or in shared memory. */
#define LMK_GDN_MAX_DIM 256

typedef struct lmk_gdn_args {
    const void *q, *k, *v;        /* [T, Hk, dk], [T, Hk, dk], [T, Hv, dv]; last axis dense */
    void *out;                    /* [T, Hv, dv] */
    lmk_dtype dtype;              /* q, k, v and out */
    size_t T, Hk, Hv, dk, dv;
    size_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head; /* element strides */
    const void *a, *b;            /* [T, Hv], heads dense */
    lmk_dtype a_dtype, b_dtype;
    size_t a_tok, b_tok;
    const void *A_log, *dt_bias;  /* [Hv] dense, or both NULL: a is g and b is beta */
    lmk_dtype A_dtype, dt_dtype;
    const void *z;                /* [T, Hv, dv] or NULL (no output norm) */
    lmk_dtype z_dtype;
    size_t z_tok, z_head;
    const void *norm_w;           /* [dv] dense; given exactly when z is */
    lmk_dtype nw_dtype;
    const void *cu_seqlens;       /* [n_seq + 1], or NULL: one sequence of T tokens */
    int cu_is64;
    const void *slots;            /* [n_seq], or NULL: sequence s uses row s */
    int slots_is64;
    size_t n_seq;
    void *state;                  /* [n_slots, Hv, dk, dv], or NULL */
    lmk_dtype state_dtype;        /* f32 or bf16 */
    size_t n_slots;
    size_t s_slot, s_head, s_k, s_v; /* the state's strides in elements */
    lmk_repeat_layout head_map;   /* TILED: k head h % Hk; BLOCK: h / (Hv / Hk) */
    float scale;                  /* resolved: never 0 */
    bool l2norm;
    float eps, weight_offset;     /* the gated norm, when z is given */
} lmk_gdn_args;

/* The k head value head h reads. */
static inline size_t lmk_gdn_k_head(const lmk_gdn_args *a, size_t h)
{
    return a->head_map == LMK_REPEAT_BLOCK ? h / (a->Hv / a->Hk) : h % a->Hk;
}

/* The float64 reference over host memory: out and the state rows exactly as lmk.h defines them,
 * the state carried in double and rounded once to its dtype at each sequence's end. */
void lmk_ref_gated_delta_rule(const lmk_gdn_args *a);

#ifdef __cplusplus
}
#endif
#endif /* LMK_OPS_GATED_DELTA_RULE_H */
