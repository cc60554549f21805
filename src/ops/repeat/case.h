/*
 * case.h - what the repeat tests share with repeat's case descriptor (case.c, built into the test
 * kit's library lmk_cases): the GQA shapes of real models, the name of an lmk_repeat_tiled case,
 * and the host arguments of a dense tiled repeat for the reference. They sit in the op's folder so
 * that the generic kit (testkit/) names no op of its own.
 */
#ifndef LMK_OPS_REPEAT_CASE_H
#define LMK_OPS_REPEAT_CASE_H

#include "ops/repeat/repeat.h"
#include "testkit.h"

typedef struct tst_gqa_shape {
    const char *model;          /* Gated DeltaNet q/k broadcast */
    uint32_t hg, h, k;
} tst_gqa_shape;
extern const tst_gqa_shape tst_gqa_shapes[];
extern const int tst_gqa_shape_count;

/* "repeat_tiled T=4106 hg=16 h=48 k=128 f32" plus " // comment" when comment is not NULL or empty.
 * Returns buf. */
char *tst_repeat_name(char *buf, size_t n, const lmk_repeat_tiled_params *p, lmk_dtype dtype, const char *comment);

/* Host arguments of a dense tiled repeat (lmk_repeat_tiled) for lmk_ref_repeat. */
lmk_repeat_args tst_repeat_host_args(const void *src, void *dst, size_t seq, size_t hg, size_t h, size_t k, size_t es);

#endif /* LMK_OPS_REPEAT_CASE_H */
