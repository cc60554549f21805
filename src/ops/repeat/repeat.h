/*
 * repeat.h - the arguments a repeat launch hands to a backend (lmk_repeat_heads and
 * lmk_repeat_tiled both become one lmk_repeat_args), and the reference over them.
 */
#ifndef LMK_OPS_REPEAT_H
#define LMK_OPS_REPEAT_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lmk_repeat_args {
    const void *src;
    void *dst;
    size_t seq, hg, h, k;        /* element counts */
    size_t elem_size;            /* bytes per element, 1..8 */
    size_t src_tok, src_head;    /* strides of src in elements (the last axis is dense) */
    size_t dst_tok, dst_head;    /* strides of dst in elements */
    lmk_repeat_layout layout;    /* TILED: head i reads i % hg; BLOCK: i / (h / hg) */
} lmk_repeat_args;

/* Naive reference over host memory: one element at a time through the strides. */
void lmk_ref_repeat(const lmk_repeat_args *a);

#ifdef __cplusplus
}
#endif
#endif /* LMK_OPS_REPEAT_H */
